"""User-settable engine and sampling configuration, validated on construction."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from multilora_studio.adapters.adapter_config import DEFAULT_MAX_LORA_RANK
from multilora_studio.engine.quantization import QUANTIZATIONS
from multilora_studio.engine.structured import StructuredOutput

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


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        limit = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {limit}, got {value}")


def _check_number(name: str, value: object, low: float, high: float, low_inclusive: bool) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value < low or (value == low and not low_inclusive) or value > high:
        opening = "[" if low_inclusive else "("
        raise ValueError(f"{name} must be in {opening}{low:g}, {high:g}], got {value!r}")


def _as_tuple(name: str, value: object, item: str) -> tuple:
    """A user's list (or None for none) as a tuple; ValueError for anything that is not a list."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of {item}, got {value!r}")
    return tuple(value)


ADAPTER_LOADERS = ("auto", "thread", "process")


@dataclass
class EngineConfig:
    """How the engine is built. ``model=None`` means the embedded default model.

    Names follow vLLM's flags where one exists.
    """

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_loras: int = 8
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    # Adapters kept in host RAM (the tier between the GPU slots and the disk). None: as many
    # adapters of max_lora_rank as fit in cpu_lora_memory_fraction of the host memory available
    # when the engine starts, at least 2 x max_loras (engine/host_tier_size.py).
    max_cpu_loras: int | None = None
    cpu_lora_memory_fraction: float = 0.25
    max_num_seqs: int = 64
    max_model_len: int = 2048
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory_gb: float | None = None
    # The part of the GPU's memory this engine sizes its KV cache within when kv_cache_memory_gb
    # is not set (replicas sharing one GPU each get their part); 1 = all that is free.
    device_memory_share: float = 1.0
    enforce_eager: bool = False
    # Seeds the random streams of requests that set no seed of their own: an engine given the
    # same seed and the same requests in the same order samples the same tokens.
    seed: int = 0
    # Where adapters are read, validated and packed: "thread" (loader threads), "process"
    # (spawned child processes, so loads never hold the worker's GIL) or "auto": process on
    # CUDA, where the worker must keep launching steps during loads, thread on the CPU.
    adapter_loader: str = "auto"
    # Adapter loads from disk at once (loader threads, and as many children with "process").
    # None: 1 on the CPU (loads compete with decoding for the cores), else min(8, cores // 2): with
    # 1,000s of adapters four loads at once (0.11 s each for an 8B rank-16 adapter) were the limit.
    adapter_load_workers: int | None = None
    # Whether steps of up to 256 tokens compute the LoRA shrink inside the base GEMMs: every
    # slot's A is stored as extra rows after the base weight's rows, so one GEMM gives the
    # base output and each token's shrink against every slot, and the expand reads its own
    # slot's (docs/dev/engine.md). One launch fewer per projection, but it reads every slot's A
    # whatever the batch uses. None: on CUDA when max_loras x max_lora_rank <= 768 (on the
    # H200 it was faster at any adapter mix with 512, slower with 1024), never on the CPU
    # (engine/lora_plan_builder.py decides).
    lora_shrink_in_gemm: bool | None = None
    # Whether the q/k/v LoRA expand, RoPE and the K/V cache write run as one Triton launch
    # (kernels/qkv_epilogue.py). None: on CUDA; True also on the CPU under TRITON_INTERPRET=1
    # (tests), the separate launches elsewhere.
    fused_qkv_epilogue: bool | None = None
    # CPU: reorder the base GEMM weights once into oneDNN's blocked layout (about 1.7x faster
    # decode GEMMs, kernels/cpu_linear.py) where this torch build supports it.
    cpu_weight_packing: bool = True
    # Batch invariance: a request's logits, and so its tokens and log-probabilities, do not
    # depend on what else is in the batch or on how its prompt is split into steps. Every
    # choice that makes a row's arithmetic depend on the batch is pinned in the plan
    # (engine/lora_plan_builder.py; docs/dev/engine.md, "Batch-invariant mode"); it costs speed.
    batch_invariant: bool = False
    # Adapters that replace embedding or LM-head rows (modules_to_save, trainable or added
    # tokens) hold their tables on the device while in a slot: at most this many at once, in
    # at most this much memory (reserved out of the KV cache's share on CUDA; an 8B model's
    # lm_head is about 1 GB in bf16). engine/token_tables.py.
    max_token_tables: int = 4
    token_table_memory_gb: float = 2.0
    # torch's CPU threads for the engine's steps when it runs on the CPU. None: one less than
    # the cores this process may use (at least 1), which leaves a core to the window, the
    # server and the adapter loader; on CUDA torch keeps its own count. On a shared 2-core
    # machine torch's default (every core) decoded 8x slower under load (docs/BENCHMARKS.md).
    cpu_threads: int | None = None
    # The base's quantization (vLLM's --quantization). None: as the checkpoint is (float, or
    # the FP8 / AWQ / GPTQ its config.json declares); "fp8": an FP8 checkpoint as it is, a float
    # one quantized to FP8 per channel at load; "awq" / "gptq": a checkpoint of that kind (random
    # shapes are quantized at load). engine/quantization.py; docs/dev/engine.md, "Quantized bases".
    quantization: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError("model must be a folder path or None for the embedded default model")
        if not isinstance(self.device, str) or not DEVICE_NAME.match(self.device):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if not isinstance(self.dtype, str) or self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(SUPPORTED_DTYPES)}, got {self.dtype!r}")
        _check_int("max_loras", self.max_loras, 1, MAX_SLOTS)
        _check_int("max_lora_rank", self.max_lora_rank, 1, 512)
        if self.max_cpu_loras is not None:
            _check_int("max_cpu_loras", self.max_cpu_loras, 1)
            if self.max_cpu_loras < self.max_loras:
                raise ValueError(
                    f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
                )
        _check_number("cpu_lora_memory_fraction", self.cpu_lora_memory_fraction, 0, 0.9, low_inclusive=False)
        _check_int("max_num_seqs", self.max_num_seqs, 1, 4096)
        _check_int("max_model_len", self.max_model_len, 16, 1 << 20)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1, 1 << 20)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be >= max_num_seqs so every running request can decode"
            )
        _check_int("block_size", self.block_size, 1, 256)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.kv_cache_memory_gb is not None:
            _check_number("kv_cache_memory_gb", self.kv_cache_memory_gb, 0, 4096, low_inclusive=False)
        _check_number("device_memory_share", self.device_memory_share, 0, 1, low_inclusive=False)
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        _check_int("seed", self.seed, 0)
        if self.adapter_loader not in ADAPTER_LOADERS:
            raise ValueError(
                f"adapter_loader must be one of {', '.join(ADAPTER_LOADERS)}, got {self.adapter_loader!r}"
            )
        if self.adapter_load_workers is not None:
            _check_int("adapter_load_workers", self.adapter_load_workers, 1, 64)
        if self.cpu_threads is not None:
            _check_int("cpu_threads", self.cpu_threads, 1, 1024)
        for name in ("lora_shrink_in_gemm", "fused_qkv_epilogue"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True, False or None, got {value!r}")
        _check_int("max_token_tables", self.max_token_tables, 0, MAX_SLOTS)
        _check_number("token_table_memory_gb", self.token_table_memory_gb, 0, 4096, low_inclusive=True)
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATIONS)} or None, got {self.quantization!r}"
            )
        for name in ("cpu_weight_packing", "batch_invariant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

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
    # Logits processors (engine/logits_processors.py; docs/dev/engine.md, "Sampling order"), all
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
        _check_int("max_tokens", self.max_tokens, 0)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 0, MAX_LOGPROBS)
        _check_number("temperature", self.temperature, 0, 100, low_inclusive=True)
        _check_number("top_p", self.top_p, 0, 1, low_inclusive=False)
        _check_int("top_k", self.top_k, 0)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = _as_tuple("stop", self.stop, "non-empty strings")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {list(self.stop)!r}")
        self.stop_token_ids = _as_tuple("stop_token_ids", self.stop_token_ids, "token ids")
        for token in self.stop_token_ids:
            _check_int("stop_token_ids entry", token, 0)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        _check_number("adapter_scale", self.adapter_scale, 0, MAX_ADAPTER_SCALE, low_inclusive=True)
        self.adapter_scale = float(self.adapter_scale)
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise ValueError(f"structured must be a StructuredOutput, got {self.structured!r}")
        self._check_processors()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name), -MAX_PENALTY, MAX_PENALTY, low_inclusive=True)
            setattr(self, name, float(getattr(self, name)))
        _check_number("repetition_penalty", self.repetition_penalty, 0, MAX_REPETITION_PENALTY, False)
        self.repetition_penalty = float(self.repetition_penalty)
        _check_number("min_p", self.min_p, 0, 1, low_inclusive=True)
        self.min_p = float(self.min_p)
        if self.logit_bias is None:
            self.logit_bias = {}
        if not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping of token id to bias, got {self.logit_bias!r}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(
                f"logit_bias may hold at most {MAX_LOGIT_BIAS_TOKENS} token ids, got {len(self.logit_bias)}"
            )
        bias = {}
        for token, value in self.logit_bias.items():
            _check_int("logit_bias token id", token, 0)
            _check_number("logit_bias value", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, low_inclusive=True)
            bias[token] = float(value)
        self.logit_bias = bias
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        words = _as_tuple("bad_words_token_ids", self.bad_words_token_ids, "lists of token ids")
        if len(words) > MAX_BAD_WORDS:
            raise ValueError(f"bad_words_token_ids may hold at most {MAX_BAD_WORDS} sequences")
        checked = []
        for word in words:
            ids = _as_tuple("bad_words_token_ids", word, "lists of token ids")
            if not ids:
                raise ValueError("bad_words_token_ids must not hold an empty sequence")
            for token in ids:
                _check_int("bad_words_token_ids entry", token, 0)
            checked.append(ids)
        tokens = sum(len(ids) for ids in checked)
        if tokens > MAX_BAD_WORDS_TOKENS:
            raise ValueError(
                f"bad_words_token_ids may hold at most {MAX_BAD_WORDS_TOKENS} tokens in all, got {tokens}"
            )
        self.bad_words_token_ids = tuple(checked)

    @property
    def greedy(self) -> bool:
        """Temperatures below ``GREEDY_BELOW`` are the greedy limit (dividing by them overflows)."""
        return self.temperature < GREEDY_BELOW
