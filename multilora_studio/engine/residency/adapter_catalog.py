"""The adapters added to one engine: names, validated summaries, own tokenizers and chat
templates, and the host tier their weights are read into.

Thread contract: any thread may call every method (the ``Engine`` facade's callers, the
worker, loader threads); the entries are guarded by one lock, and the host tier
(``HostTier``) is thread-safe itself. The GPU slots, the uploads and which loads start for
queued requests belong to the worker thread alone (``WorkerTierManager``, ``tier_manager.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.adapters.adapter_tokenizer import AdapterTokenizer, adapter_tokenizer
from multilora_studio.adapters.peft_adapter import inspect_peft_adapter
from multilora_studio.adapters.short_lived_workers import call_on_short_lived_thread
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.errors import UnknownAdapter
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.residency.host_tier import HostTier
from multilora_studio.engine.text.chat_tokens import Render, render_in_process
from multilora_studio.engine.text.template_sandbox import TemplateSandbox
from multilora_studio.invalid_setting import InvalidSetting

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
# Each added adapter's version, new at every add (a removed adapter added again under its name
# gets another): KV its requests made is cached under it, never under the name.
_versions = itertools.count(1)


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    size_bytes: int
    kind: str = "LoRA"  # AdapterConfig.kind: "DoRA", "LoRA", "aLoRA", either "with bias"
    tokens: str = ""  # the embedding / LM-head rows it replaces (TokenTablePlan.label), or ""
    tokenizer: str = ""  # AdapterTokenizer.label ("own tokenizer / template", ...), or ""
    vocab_size: int = 0  # its vocabulary (the base's unless it adds tokens)
    table_bytes: int = 0  # its whole embed_tokens / lm_head matrices on the device
    version: int = 0  # this loading of its weights (new at every add)
    # an activated LoRA's invocation (alora_invocation_tokens); () for any other adapter
    invocation_tokens: tuple[int, ...] = ()


class ThreadSafeAdapterCatalog:
    """The adapters of one engine, for any thread: what was added, and its host-tier copies."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        model_name: str,
        device: torch.device,
        dtype: torch.dtype,
        wake: Callable[[], None],
        base_tokenizer: Any = None,
    ) -> None:
        self.config = config
        self.spec = spec
        self.model_name = model_name
        self.dtype = dtype
        self._lock = threading.Lock()  # guards _adapters and _tokenizers
        self._adapters: dict[str, AdapterInfo] = {}
        self._tokenizers: dict[str, AdapterTokenizer] = {}  # adapters with their own
        self.base_tokenizer = base_tokenizer
        self.template_sandbox = TemplateSandbox(config.max_model_len)  # their chat templates
        self.host_tier = HostTier(config, spec, device, dtype, wake, self.has_token_tables)

    def add(self, name: str, path: str | Path, preload: bool) -> AdapterInfo:
        """See ``Engine.add_adapter``."""
        if not isinstance(name, str) or not ADAPTER_NAME.match(name) or name in ("base", self.model_name):
            raise ValueError(
                f"invalid adapter name {name!r}: use 1-128 letters, digits or ._:/@+- "
                "(and not 'base' or the base model's name)"
            )
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} already exists; remove it first")
        path = Path(path)
        spec = self.spec
        summary = inspect_peft_adapter(
            path, spec.num_layers, spec.projection_shape, self.config.max_lora_rank, spec.vocab
        )
        spec.check_lora_targets(summary.targets, path)
        self._check_table_budget(path, summary.table_values * self.dtype.itemsize, bool(summary.tokens))
        vocab_size = summary.vocab_size or spec.vocab_size
        tokenizer = adapter_tokenizer(path, self.base_tokenizer, vocab_size)
        info = AdapterInfo(
            name, path, summary.rank, summary.alpha, summary.targets, summary.size_bytes, summary.kind,
            summary.tokens, tokenizer.label if tokenizer is not None else "", vocab_size,
            summary.table_values * self.dtype.itemsize, next(_versions), summary.invocation_tokens,
        )  # fmt: skip
        packed = None
        if preload:
            # On a thread that ends with the load: see adapters/short_lived_workers.py.
            host, packed = call_on_short_lived_thread(lambda: self.host_tier.read_and_pack(name, path))
            info = dataclasses.replace(info, size_bytes=host.nbytes)
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"an adapter named {name!r} already exists; remove it first")
            self._adapters[name] = info
            if tokenizer is not None:
                self._tokenizers[name] = tokenizer
        if tokenizer is not None:
            self.template_sandbox.warm()  # its first chat need not wait for a renderer to start
        if packed is not None:
            self.host_tier.cache.put(packed)
        return info

    def _check_table_budget(self, path: Path, table_bytes: int, has_tables: bool) -> None:
        """ValueError when the adapter's token tables could never fit the device's pool."""
        config = self.config
        if has_tables and config.max_token_tables == 0:
            raise InvalidSetting(
                "{path} replaces embedding / lm_head rows, and {max_token_tables} is 0",
                {"max_token_tables": 0},
                {"path": path},
            )
        limit = int(config.token_table_memory_gb * (1 << 30))
        if table_bytes > limit:
            raise InvalidSetting(
                "{path}: its embed_tokens / lm_head tables take {gib:.2f} GiB, more than "
                "{token_table_memory_gb:=}; raise it to serve this adapter",
                {"token_table_memory_gb": f"{config.token_table_memory_gb:g}"},
                {"path": path, "gib": table_bytes / 2**30},
            )

    def forget(self, name: str) -> None:
        """Drop ``name``'s entry (the worker has freed its slot and host copy first)."""
        with self._lock:
            del self._adapters[name]
            self._tokenizers.pop(name, None)

    def infos(self) -> list[AdapterInfo]:
        with self._lock:
            return list(self._adapters.values())

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._adapters

    def info_of(self, name: str) -> AdapterInfo | None:
        """``name``'s summary; None once it is removed (or was never added)."""
        with self._lock:
            return self._adapters.get(name)

    def require(self, name: str) -> AdapterInfo:
        """``name``'s summary; ValueError unless it was added."""
        info = self.info_of(name)
        if info is None:
            raise ValueError(f"unknown adapter {name!r}")
        return info

    def has_token_tables(self, name: str) -> bool:
        """Whether ``name`` replaces embedding / LM-head rows (its tables can take GBs)."""
        info = self.info_of(name)
        return info is not None and bool(info.tokens)

    def tokenizer_of(self, name: str | None) -> AdapterTokenizer | None:
        """The adapter's own tokenizer / template (None: it uses the base's)."""
        if name is None:
            return None
        with self._lock:
            return self._tokenizers.get(name)

    def renderer_of(self, name: str | None) -> Render:
        """How ``name``'s chat template renders: in the sandbox when the adapter brings its own
        tokenizer or template, here for the base model's."""
        if self.tokenizer_of(name) is None:
            return render_in_process
        return self.template_sandbox.render

    def vocab_size_of(self, name: str | None) -> int:
        """The vocabulary of ``name``'s rows (the base's for None or an adapter that adds none)."""
        if name is None:
            return self.spec.vocab_size
        info = self.info_of(name)
        return info.vocab_size if info is not None and info.vocab_size else self.spec.vocab_size

    def invocation_of(self, name: str | None) -> tuple[int, ...]:
        """The added adapter's aLoRA invocation (``AdapterInfo.invocation_tokens``); () for the
        base, a plain adapter or one removed."""
        info = self.info_of(name) if name is not None else None
        return info.invocation_tokens if info is not None else ()

    def kind_of(self, name: str) -> str:
        """The added adapter's kind (``AdapterInfo.kind``)."""
        with self._lock:
            return self._adapters[name].kind

    def check_known(self, name: str) -> None:
        """Raise UnknownAdapter, naming the adapters there are, unless ``name`` was added."""
        with self._lock:
            if name in self._adapters:
                return
            names = sorted(self._adapters)
        known = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise UnknownAdapter(f"unknown adapter {name!r} (known: {known or 'none'})")

    def prefetch(self, names: Sequence[str], timeout: float | None) -> dict[str, str | None]:
        """See ``Engine.prefetch_adapters``."""
        capacity = self.host_tier.cache.capacity
        if len(names) > capacity:
            raise InvalidSetting(
                "{count} adapters do not fit the host tier of {capacity} ({max_cpu_loras})",
                {"max_cpu_loras": capacity},
                {"count": len(names), "capacity": capacity},
            )
        with self._lock:
            unknown = [name for name in names if name not in self._adapters]
            paths = {name: self._adapters[name].path for name in names if name not in unknown}
        if unknown:
            raise ValueError(f"unknown adapters: {', '.join(unknown[:5])}")
        return self.host_tier.prefetch(paths, timeout)

    def close(self) -> None:
        """Stop the loader threads and children and the template renderer (after the worker)."""
        self.host_tier.close()
        self.template_sandbox.close()
