"""User-settable engine configuration (`EngineConfig`), validated on construction."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from multilora_studio.adapters.adapter_config import DEFAULT_MAX_LORA_RANK
from multilora_studio.engine.model.quantization import QUANTIZATIONS
from multilora_studio.engine.settings import check_declared, setting
from multilora_studio.invalid_setting import InvalidSetting

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16", "auto")
MAX_SLOTS = 1024
DEVICE_NAME = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
ADAPTER_LOADERS = ("auto", "thread", "process")
DEFAULT_CPU_LORA_MEMORY_FRACTION = 0.25


@dataclass
class EngineConfig:
    """How the engine is built. ``model=None`` means the embedded default model.

    Names follow vLLM's flags where one exists. Each field is declared with its flag, its label in
    the window's Settings and its bounds (``engine/settings.py``).
    """

    model: str | None = setting(
        None,
        doc="a Hugging Face model folder with safetensors weights; `None`: the embedded "
        "SmolLM2-135M-Instruct; `random:llama3-8b`, `random:qwen3-8b`, `random:gemma2-9b`, "
        "`random:llama3.2-1b`, `random:smollm2-135m`: random weights of that shape, without a "
        "tokenizer (for benchmarks)",
        flag="--model",
        help="HF model folder (default: the embedded model)",
        label="Base model",
    )
    device: str = setting(
        "auto",
        doc="`cpu`, `cuda` or `cuda:N`; `auto`: the GPU when there is one, else the CPU",
        flag="--device",
        help="auto, cpu, cuda or cuda:N (default: %(default)s)",
        label="Device",
        group="engine",
    )
    dtype: str = setting(
        "auto",
        doc="`float32`, `bfloat16` or `float16`; `auto`: bfloat16 on CUDA, float32 on the CPU",
        flag="--dtype",
        help="auto, float32, bfloat16 or float16 (default: %(default)s)",
        flag_checks_choices=False,
        label="Data type",
        group="engine",
        choices=SUPPORTED_DTYPES,
    )
    max_loras: int = setting(
        8,
        doc="GPU slots: adapters on the device at once (1 to 1,024). More adapters than slots are "
        "served too; they take turns",
        flag="--max-loras",
        help="adapters resident on the device at once (default: %(default)s)",
        label="GPU adapter slots",
        group="engine",
        low=1,
        high=MAX_SLOTS,
    )
    max_lora_rank: int = setting(
        DEFAULT_MAX_LORA_RANK,
        doc="the largest adapter rank accepted (1 to 512); it sizes the slots, so raise it only as "
        "far as your adapters need",
        flag="--max-lora-rank",
        help="largest adapter rank accepted (default: %(default)s)",
        label="Largest adapter rank",
        group="engine",
        low=1,
        high=512,
    )
    # Adapters kept in host RAM (the tier between the GPU slots and the disk). None: as many
    # adapters of max_lora_rank as fit in cpu_lora_memory_fraction of the host memory available
    # when the engine starts, at least 2 x max_loras (engine/residency/host_tier_size.py).
    max_cpu_loras: int | None = setting(
        None,
        doc="adapters kept ready in host RAM; `None`: as many adapters of `max_lora_rank` as fit in "
        "`cpu_lora_memory_fraction` of the free host memory at start, at least 2 x `max_loras`; if "
        "set, at least `max_loras`",
        flag="--max-cpu-loras",
        help="adapters kept in host RAM (default: as many as fit in --cpu-lora-memory-fraction of the "
        "free host memory, at least 2 x --max-loras)",
        label="Adapters kept in CPU RAM",
        group="engine",
        low=1,
        none=f"automatic ({DEFAULT_CPU_LORA_MEMORY_FRACTION:.0%} of free host memory)",
    )
    cpu_lora_memory_fraction: float = setting(
        DEFAULT_CPU_LORA_MEMORY_FRACTION,
        doc="the share of free host memory that the automatic `max_cpu_loras` may fill (above 0, at "
        "most 0.9)",
        flag="--cpu-lora-memory-fraction",
        help="share of the free host memory the adapter tier may fill without --max-cpu-loras "
        "(default: %(default)s)",
        low=0,
        above=True,
        high=0.9,
    )
    max_num_seqs: int = setting(
        64,
        doc="requests running at once; more wait in the queue",
        flag="--max-num-seqs",
        help="requests running at once (default: %(default)s)",
        low=1,
        high=4096,
    )
    max_model_len: int = setting(
        2048,
        doc="prompt plus output tokens of one request (a longer prompt is refused)",
        flag="--max-model-len",
        help="prompt + output tokens per request (default: %(default)s)",
        low=16,
        high=1 << 20,
    )
    max_num_batched_tokens: int = setting(
        2048,
        doc="tokens one step may run (prompt chunks and decodes); at least `max_num_seqs`",
        low=1,
        high=1 << 20,
    )
    block_size: int = setting(16, doc="tokens per KV-cache block (a power of two)", low=1, high=256)
    kv_cache_memory_gb: float | None = setting(
        None,
        doc="the KV cache's size; `None`: 85 % of the free GPU memory less 2 GiB and the adapters' "
        "buffers, or 512 MiB on the CPU, never more than `max_num_seqs` x `max_model_len` tokens need",
        flag="--kv-cache-gb",
        help="KV cache size (default: automatic)",
        label="KV cache per base (GB)",
        tip="Each base's KV cache; needed when several base models share a GPU",
        group="bases",
        low=0,
        above=True,
        high=4096,
        none="the engine's sizing",
        step=0.5,
    )
    # The part of the GPU's memory this engine sizes its KV cache within when kv_cache_memory_gb
    # is not set (replicas sharing one GPU each get their part); 1 = all that is free.
    device_memory_share: float = setting(
        1.0,
        doc="the part of the GPU this engine sizes its KV cache in when `kv_cache_memory_gb` is not "
        "set (several engines on one GPU)",
        low=0,
        above=True,
        high=1,
    )
    enforce_eager: bool = setting(False, doc="no CUDA graphs (slower; for debugging)")
    # Seeds the random streams of requests that set no seed of their own: an engine given the
    # same seed and the same requests in the same order samples the same tokens.
    seed: int = setting(
        0,
        doc="seeds the requests that set no `SamplingParams.seed`: the same engine seed and the same "
        "requests in the same order sample the same tokens",
        low=0,
    )
    # Where adapters are read, validated and packed: "thread" (loader threads), "process"
    # (spawned child processes, so loads never hold the worker's GIL) or "auto": process on
    # CUDA, where the worker must keep launching steps during loads, thread on the CPU.
    adapter_loader: str = setting(
        "auto",
        doc="where adapters are read and checked: `thread`, `process` (child processes) or `auto` "
        "(processes on CUDA, threads on the CPU)",
        flag="--adapter-loader",
        help="where adapters are read (auto: process on CUDA)",
        choices=ADAPTER_LOADERS,
    )
    # Adapter loads from disk at once (loader threads, and as many children with "process").
    # None: 1 on the CPU (loads compete with decoding for the cores), else min(8, cores // 2): with
    # 1,000s of adapters four loads at once (0.11 s each for an 8B rank-16 adapter) were the limit.
    adapter_load_workers: int | None = setting(
        None,
        doc="adapter loads from disk at once; `None`: 1 on the CPU, `min(8, cores // 2)` on CUDA",
        flag="--load-workers",
        help="adapter loads from disk at once (default: automatic)",
        low=1,
        high=64,
    )
    # Whether steps of up to 256 tokens compute the LoRA shrink inside the base GEMMs: every
    # slot's A is stored as extra rows after the base weight's rows, so one GEMM gives the
    # base output and each token's shrink against every slot, and the expand reads its own
    # slot's (docs/dev/engine.md). One launch fewer per projection, but it reads every slot's A
    # whatever the batch uses. None: on CUDA when max_loras x max_lora_rank <= 768 (on the
    # H200 it was faster at any adapter mix with 512, slower with 1024), never on the CPU
    # (engine/step/lora_plan_builder.py decides).
    lora_shrink_in_gemm: bool | None = setting(
        None,
        doc="a CUDA speed option (the adapters' A factors stored next to the base weights); `None` "
        "decides from the slots and rank; never on the CPU or over a quantized base",
    )
    # Whether the q/k/v LoRA expand, RoPE and the K/V cache write run as one Triton launch
    # (kernels/qkv_epilogue.py). None: on CUDA; True also on the CPU under TRITON_INTERPRET=1
    # (tests), the separate launches elsewhere.
    fused_qkv_epilogue: bool | None = setting(
        None,
        doc="a CUDA speed option (one kernel for q/k/v's LoRA term, RoPE and the KV write); `None`: on CUDA",
    )
    # CPU: reorder the base GEMM weights once into oneDNN's blocked layout (about 1.7x faster
    # decode GEMMs, kernels/cpu_linear.py) where this torch build supports it.
    cpu_weight_packing: bool = setting(
        True,
        doc="CPU: lay the base weights out once for oneDNN's faster matrix products, where this "
        "PyTorch build supports it",
    )
    # Batch invariance: a request's logits, and so its tokens and log-probabilities, do not
    # depend on what else is in the batch or on how its prompt is split into steps. Every
    # choice that makes a row's arithmetic depend on the batch is pinned in the plan
    # (engine/step/lora_plan_builder.py; docs/dev/engine.md, "Batch-invariant mode"); it costs speed.
    batch_invariant: bool = setting(
        False,
        doc="outputs that do not depend on what else runs in the batch "
        "([below](#batch-invariant-mode)); slower",
        flag="--batch-invariant",
        negatable=True,
        help="a request's tokens do not depend on the rest of the batch or on prompt chunking "
        "(slower; default: %(default)s)",
        label="Batch-invariant outputs",
        tip="A request's output does not depend on what else runs with it (slower); keeps Compare "
        "and Evaluate columns comparable",
        group="engine",
    )
    # Full KV blocks stay keyed by their tokens, base, adapter version and strength after their
    # request ends, and a later request with the same prefix reuses them (engine/batch/prefix_cache.py).
    enable_prefix_caching: bool = setting(
        True,
        doc="reuse the KV of a prompt prefix an earlier request with the same adapter computed "
        "([below](#prefix-caching))",
        flag="--enable-prefix-caching",
        negatable=True,
        help="reuse the KV cache of prompt prefixes seen before, per adapter (default: %(default)s)",
        label="Prefix caching",
        tip="A prompt that starts like an earlier one with the same adapter skips computing that "
        "start again (chats, long system prompts, multiple-choice scoring)",
        group="engine",
    )
    # Adapters that replace embedding or LM-head rows (modules_to_save, trainable or added
    # tokens) hold their tables on the device while in a slot: at most this many at once, in
    # at most this much memory (reserved out of the KV cache's share on CUDA; an 8B model's
    # lm_head is about 1 GB in bf16). engine/model/token_tables.py.
    max_token_tables: int = setting(
        4,
        doc="adapters that bring their own embedding or LM-head rows (`modules_to_save`, trainable "
        "or added tokens) on the device at once; 0 refuses such adapters",
        flag="--max-token-tables",
        help="adapters with embed_tokens / lm_head tables (modules_to_save, trainable or added tokens) "
        "on the device at once (default: %(default)s)",
        low=0,
        high=MAX_SLOTS,
    )
    token_table_memory_gb: float = setting(
        2.0,
        doc="device memory for those rows",
        flag="--token-table-gb",
        help="device memory for those tables, reserved out of the KV cache (default: %(default)s)",
        low=0,
        high=4096,
    )
    # torch's CPU threads for the engine's steps when it runs on the CPU. None: one less than
    # the cores this process may use (at least 1), which leaves a core to the window, the
    # server and the adapter loader; on CUDA torch keeps its own count. On a shared 2-core
    # machine torch's default (every core) decoded 8x slower under load (docs/BENCHMARKS.md).
    cpu_threads: int | None = setting(
        None,
        doc="PyTorch threads of a CPU engine; `None`: one less than the cores this process may use "
        "(at least 1), which leaves a core to the window, the server and the adapter loader",
        flag="--cpu-threads",
        help="torch threads of the engine's steps on the CPU (default: one less than the usable cores)",
        label="CPU threads of the engine",
        tip="torch threads of the engine's steps when it runs on the CPU",
        group="engine",
        low=1,
        high=1024,
        none="automatic (usable cores − 1)",
    )
    # The base's quantization (vLLM's --quantization). None: as the checkpoint is (float, or
    # the FP8 / AWQ / GPTQ its config.json declares); "fp8": an FP8 checkpoint as it is, a float
    # one quantized to FP8 per channel at load; "int4": a float one quantized to 4 bits at load;
    # "awq" / "gptq": a checkpoint of that kind (random shapes are quantized at load).
    # engine/model/quantization.py; docs/dev/engine.md, "Quantized bases".
    quantization: str | None = setting(
        None,
        doc="`fp8`, `int4`, `awq` or `gptq`: the base's quantization ([below](#quantized-bases)); "
        "`None`: as the checkpoint is",
        flag="--quantization",
        help="the base's quantization: fp8 serves an FP8 checkpoint or quantizes a float base to FP8 at "
        "load; int4 quantizes a float base to 4 bits at load; awq / gptq expect such a checkpoint "
        "(default: as the checkpoint is)",
        label="Quantization",
        tip="fp8: an FP8 checkpoint, or a float base quantized to FP8 when it loads; int4: a float base "
        "quantized to 4 bits (groups of 128, round to nearest) when it loads; awq / gptq: such a "
        "checkpoint (its adapters trained on the float base are served on it)",
        group="model",
        choices=QUANTIZATIONS,
        none="as the checkpoint is",
    )

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise InvalidSetting(
                "{model} must be a folder path or None for the embedded default model", {"model": self.model}
            )
        if not isinstance(self.device, str) or not DEVICE_NAME.match(self.device):
            raise InvalidSetting.of(
                "device", self.device, "must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}"
            )
        check_declared(self)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise InvalidSetting(
                "{max_cpu_loras:()} must be >= {max_loras:()}",
                {"max_cpu_loras": self.max_cpu_loras, "max_loras": self.max_loras},
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidSetting(
                "{max_num_batched_tokens} must be >= {max_num_seqs} so every running request can decode",
                {"max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs},
            )
        if self.block_size & (self.block_size - 1):
            raise InvalidSetting.of("block_size", self.block_size, "must be a power of two, got {value}")

    def loader_for(self, device_type: str) -> str:
        """The adapter loader used on ``device_type``, "thread" or "process" (see ``adapter_loader``)."""
        if self.adapter_loader != "auto":
            return self.adapter_loader
        return "process" if device_type == "cuda" else "thread"

    def cpu_threads_for(self, device_type: str) -> int | None:
        """torch's CPU threads for the steps on ``device_type`` (see ``cpu_threads``); None: torch's own."""
        if self.cpu_threads is not None:
            return self.cpu_threads
        if device_type != "cpu":
            return None
        return max(1, usable_cores() - 1)

    def load_workers_for(self, device_type: str) -> int:
        """How many adapter loads run at once on ``device_type`` (see ``adapter_load_workers``)."""
        if self.adapter_load_workers is not None:
            return self.adapter_load_workers
        if device_type == "cpu":
            return 1
        return max(1, min(8, (os.cpu_count() or 1) // 2))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
