"""User-settable engine and sampling configuration, validated on construction."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from multilora_studio.adapters.adapter_config import DEFAULT_MAX_LORA_RANK
from multilora_studio.engine.model.quantization import QUANTIZATIONS
from multilora_studio.engine.sampling.structured import StructuredOutput
from multilora_studio.engine.settings import check_declared, check_int, check_number, setting
from multilora_studio.invalid_setting import InvalidSetting

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16", "auto")
MAX_SLOTS = 1024
MAX_SEED = 2**63 - 1  # torch.Generator seeds are signed 64-bit
MAX_LOGPROBS = 20  # top alternatives a request may ask for per token (OpenAI's and vLLM's limit)
GREEDY_BELOW = 1e-5
# Largest adapter strength a request may ask for (SamplingParams.adapter_scale): 16x an
# adapter's own scale is far past any useful extrapolation and still far from float overflow.
MAX_ADAPTER_SCALE = 16.0
MAX_PENALTY = 2.0  # presence_penalty / frequency_penalty range is [-2, 2] (OpenAI's)
MAX_REPETITION_PENALTY = 100.0  # past this a seen token's logit is as good as removed
MAX_LOGIT_BIAS = 100.0  # logit_bias values range over [-100, 100] (OpenAI's)
MAX_LOGIT_BIAS_TOKENS = 300  # logit_bias entries per request (OpenAI's limit)
# bad_words_token_ids per request: sequences and their tokens in all (vLLM's limits are 128 words,
# 1024 tokens; a word gives up to two sequences, with and without a leading space)
MAX_BAD_WORDS = 256
MAX_BAD_WORDS_TOKENS = 1024
DEVICE_NAME = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def _as_tuple(name: str, value: object, item: str) -> tuple:
    """A user's list (or None for none) as a tuple; InvalidSetting for anything that is not a list."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidSetting.of(name, value, f"must be a list of {item}, got {{value!r}}")
    return tuple(value)


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
    # one quantized to FP8 per channel at load; "awq" / "gptq": a checkpoint of that kind (random
    # shapes are quantized at load). engine/model/quantization.py; docs/dev/engine.md, "Quantized bases".
    quantization: str | None = setting(
        None,
        doc="`fp8`, `awq` or `gptq`: the base's quantization ([below](#quantized-bases)); `None`: as "
        "the checkpoint is",
        flag="--quantization",
        help="the base's quantization: fp8 serves an FP8 checkpoint or quantizes a float base to FP8 at "
        "load; awq / gptq expect such a checkpoint (default: as the checkpoint is)",
        label="Quantization",
        tip="fp8: an FP8 checkpoint, or a float base quantized to FP8 when it loads; awq / gptq: such a "
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


@dataclass
class SamplingParams:
    """How one request samples. ``temperature=0`` is greedy."""

    # 0: only the prompt runs (and is scored, with ``prompt_logprobs``); the request ends with
    # reason "length" and no token, as OpenAI's legacy ``echo`` with ``max_tokens=0``.
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    ignore_eos: bool = False
    # Log-probabilities of the model's distribution (raw logits: before temperature, top-k/top-p
    # and every other sampling filter, as OpenAI reports them). None: none (costs nothing);
    # 0: each generated token's own; k: also the k most likely tokens at each step.
    logprobs: int | None = None
    # The same for every prompt token given the ones before it (vLLM's ``prompt_logprobs``).
    prompt_logprobs: int | None = None
    # Adapter strength: the request's LoRA term is multiplied by it (on top of the adapter's own
    # alpha / r); 0 gives the base model's output through the adapter's slot, 1 the adapter as
    # trained. Needs an adapter (a base request with another value is refused at submit).
    adapter_scale: float = 1.0
    # What the output must match (a JSON schema, a regex, a grammar ...); None: free text.
    structured: StructuredOutput | None = None
    # Logits processors (engine/sampling/logits_processors.py; docs/dev/engine.md, "Sampling order"), all
    # off by default. OpenAI's penalties over the tokens generated so far: logit -= presence *
    # (count > 0) + frequency * count.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's / HF's: a token seen in the prompt or the output has its logit divided by it when
    # positive, multiplied when not; 1.0 = off.
    repetition_penalty: float = 1.0
    # Tokens whose probability (after temperature) is below min_p x the largest are dropped.
    min_p: float = 0.0
    # token id -> bias added to its logit (ids checked against the vocabulary at submit).
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    # EOS (unless ignore_eos) and stop_token_ids are banned, and stop strings do not end the
    # request, until this many tokens are generated.
    min_tokens: int = 0
    # Banned token sequences: a sequence's last token is banned when the output ends with the
    # tokens before it (a one-token sequence is always banned), as vLLM's bad_words.
    bad_words_token_ids: Sequence[Sequence[int]] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_int("max_tokens", self.max_tokens, 0)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 0, MAX_LOGPROBS)
        check_number("temperature", self.temperature, 0, 100, low_inclusive=True)
        check_number("top_p", self.top_p, 0, 1, low_inclusive=False)
        check_int("top_k", self.top_k, 0)
        if self.seed is not None:
            check_int("seed", self.seed, 0, MAX_SEED)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = _as_tuple("stop", self.stop, "non-empty strings")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidSetting.of(
                "stop", list(self.stop), "must be a list of non-empty strings, got {value!r}"
            )
        self.stop_token_ids = _as_tuple("stop_token_ids", self.stop_token_ids, "token ids")
        for token in self.stop_token_ids:
            check_int("stop_token_ids", token, 0, part="entry")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidSetting.of("ignore_eos", self.ignore_eos, "must be True or False, got {value!r}")
        check_number("adapter_scale", self.adapter_scale, 0, MAX_ADAPTER_SCALE, low_inclusive=True)
        self.adapter_scale = float(self.adapter_scale)
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise InvalidSetting.of(
                "structured", self.structured, "must be a StructuredOutput, got {value!r}"
            )
        self._check_processors()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            check_number(name, getattr(self, name), -MAX_PENALTY, MAX_PENALTY, low_inclusive=True)
            setattr(self, name, float(getattr(self, name)))
        check_number("repetition_penalty", self.repetition_penalty, 0, MAX_REPETITION_PENALTY, False)
        self.repetition_penalty = float(self.repetition_penalty)
        check_number("min_p", self.min_p, 0, 1, low_inclusive=True)
        self.min_p = float(self.min_p)
        if self.logit_bias is None:
            self.logit_bias = {}
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidSetting.of(
                "logit_bias", self.logit_bias, "must be a mapping of token id to bias, got {value!r}"
            )
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise InvalidSetting.of(
                "logit_bias",
                len(self.logit_bias),
                f"may hold at most {MAX_LOGIT_BIAS_TOKENS} token ids, got {{value}}",
            )
        bias = {}
        for token, value in self.logit_bias.items():
            check_int("logit_bias", token, 0, part="token id")
            check_number("logit_bias", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, True, part="value")
            bias[token] = float(value)
        self.logit_bias = bias
        check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise InvalidSetting(
                "{min_tokens:()} must be <= {max_tokens:()}",
                {"min_tokens": self.min_tokens, "max_tokens": self.max_tokens},
            )
        words = _as_tuple("bad_words_token_ids", self.bad_words_token_ids, "lists of token ids")
        if len(words) > MAX_BAD_WORDS:
            raise InvalidSetting.of(
                "bad_words_token_ids", len(words), f"may hold at most {MAX_BAD_WORDS} sequences"
            )
        checked = []
        for word in words:
            ids = _as_tuple("bad_words_token_ids", word, "lists of token ids")
            if not ids:
                raise InvalidSetting.of("bad_words_token_ids", ids, "must not hold an empty sequence")
            for token in ids:
                check_int("bad_words_token_ids", token, 0, part="entry")
            checked.append(ids)
        tokens = sum(len(ids) for ids in checked)
        if tokens > MAX_BAD_WORDS_TOKENS:
            raise InvalidSetting.of(
                "bad_words_token_ids",
                tokens,
                f"may hold at most {MAX_BAD_WORDS_TOKENS} tokens in all, got {{value}}",
            )
        self.bad_words_token_ids = tuple(checked)

    @property
    def greedy(self) -> bool:
        """Temperatures below ``GREEDY_BELOW`` are the greedy limit (dividing by them overflows)."""
        return self.temperature < GREEDY_BELOW
