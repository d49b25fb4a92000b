"""The shape of a checkpoint (llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3, and the
mixture-of-experts qwen3_moe and mixtral), from config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from multilora_studio.adapters.vocab_shape import VocabShape

# gemma3: the image-text checkpoint, served for text from its ``text_config`` (a gemma3_text)
SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "gemma3", "qwen3_moe", "mixtral",
)  # fmt: skip
GEMMA_MODEL_TYPES = ("gemma2", "gemma3_text")  # the Gemma block (ModelSpec.gemma)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # HF hidden_act -> ModelSpec.activation
QK_NORM_MODEL_TYPES = ("qwen3", "gemma3_text", "qwen3_moe")  # RMSNorm of each q and k head before RoPE
# what transformers' Gemma3TextConfig fills in where a config.json is silent (the Hub's image-text
# configs give few fields of their text_config)
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
    "hidden_activation": "gelu_pytorch_tanh",
}
GEMMA3_THETAS = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# the projection groups of a layer (one GEMM each), and those that take LoRA on a
# mixture-of-experts base (its MLP is experts: expert LoRA is not served)
GEMM_GROUPS = ("qkv", "o", "gate_up", "down")
ATTENTION_GROUPS = ("qkv", "o")


@dataclass(frozen=True)
class MoESpec:
    """The mixture-of-experts MLP (qwen3_moe, mixtral): a router [experts, H] picks ``top_k``
    experts per token from the softmax of its logits (float32), their weights renormalised to
    sum to 1 when ``norm_topk_prob``; each expert is a SiLU MLP of ``intermediate_size``.

    ``sparse_layers``: per layer, whether its MLP is the experts (False: the dense MLP of
    ``ModelSpec.intermediate_size``). ``weights_in_float32``: the routing weights scale the
    experts' outputs in float32 before the cast back (mixtral), else they are cast to the
    activations' dtype first (qwen3_moe).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]
    weights_in_float32: bool = False


@dataclass(frozen=True)
class RopeSpec:
    """RoPE and its scaling, with the fields of HF's ``rope_parameters`` (``rope.py`` reads them).

    ``attention_factor``: what cos and sin are multiplied by (yarn / longrope; None: inferred
    from ``factor`` as HF does). longrope: ``short_factor`` / ``long_factor`` per frequency,
    the long ones for sequences longer than ``original_max_position``.
    """

    theta: float
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int
    rope: RopeSpec
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # the RoPE of the sliding-window layers where it differs from ``rope`` (gemma3); None: ``rope``
    local_rope: RopeSpec | None = None
    # per layer: how many positions a query sees, itself included (None: the whole context)
    layer_windows: tuple[int | None, ...] = ()
    qk_norm: bool = False  # q_norm / k_norm weights [head_dim] per layer (qwen3)
    activation: str = "silu"  # of the gate projection: "silu" or "gelu_tanh"
    # The Gemma block: embeddings times sqrt(hidden_size); RMSNorm weights stored as w and
    # applied as (1 + w); the attention and the MLP outputs normed before their residual add
    # (post_attention_layernorm, post_feedforward_layernorm) and pre_feedforward_layernorm
    # before the MLP
    gemma: bool = False
    attention_scale: float | None = None  # softmax scale (None: head_dim ** -0.5)
    attn_softcap: float | None = None  # attention logits -> cap * tanh(logits / cap)
    final_softcap: float | None = None  # the LM head's logits, likewise
    moe: MoESpec | None = None  # the mixture-of-experts MLP (None: every layer's MLP is dense)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is the mixture of experts."""
        return self.moe is not None and self.moe.sparse_layers[layer]

    @property
    def lora_groups(self) -> tuple[str, ...]:
        """The projection groups that take LoRA: attention only on a mixture-of-experts base."""
        return ATTENTION_GROUPS if self.moe is not None else GEMM_GROUPS

    def check_lora_targets(self, targets: tuple[str, ...], where: object) -> None:
        """ValueError naming the projections of ``targets`` this base takes no LoRA on: the MLP
        of a mixture-of-experts base (expert LoRA is not served yet)."""
        if self.moe is None:
            return
        refused = [module for module in targets if module not in PROJECTIONS[:4]]
        if refused:
            raise ValueError(
                f"{where}: LoRA on {', '.join(refused)} (the MLP) is not served on the "
                f"mixture-of-experts base {self.model_type}: expert LoRA is not served yet; LoRA on "
                f"the attention projections ({', '.join(PROJECTIONS[:4])}) is"
            )

    def window_of(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (None: it sees the whole context)."""
        return self.layer_windows[layer] if self.layer_windows else None

    def uses_local_rope(self, layer: int) -> bool:
        """Whether layer ``layer`` rotates by ``local_rope`` (a sliding-window layer of gemma3)."""
        return self.local_rope is not None and self.window_of(layer) is not None

    @property
    def vocab(self) -> VocabShape:
        """What an adapter's embedding / LM-head tensors are checked against."""
        return VocabShape(self.vocab_size, self.hidden_size, self.tie_word_embeddings)

    def projection_shape(self, module: str) -> tuple[int, int]:
        """(out_features, in_features) of a LoRA-targetable projection."""
        shapes = {
            "q_proj": (self.q_size, self.hidden_size),
            "k_proj": (self.kv_size, self.hidden_size),
            "v_proj": (self.kv_size, self.hidden_size),
            "o_proj": (self.hidden_size, self.q_size),
            "gate_proj": (self.intermediate_size, self.hidden_size),
            "up_proj": (self.intermediate_size, self.hidden_size),
            "down_proj": (self.hidden_size, self.intermediate_size),
            "qkv_proj": (self.q_size + 2 * self.kv_size, self.hidden_size),  # fused (phi3)
            "gate_up_proj": (2 * self.intermediate_size, self.hidden_size),
        }
        return shapes[module]

    def num_parameters(self) -> int:
        layer_norms = 4 if self.gemma else 2
        norms = layer_norms * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        attention = sum(o * i for o, i in map(self.projection_shape, PROJECTIONS[:4])) + norms
        dense_mlp = 3 * self.hidden_size * self.intermediate_size
        moe = self.moe
        sparse = sum(moe.sparse_layers) if moe is not None else 0
        experts = (moe.num_experts * (3 * moe.intermediate_size + 1) * self.hidden_size) if moe else 0
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        layers = self.num_layers * attention + (self.num_layers - sparse) * dense_mlp + sparse * experts
        return layers + embed + head + self.hidden_size


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _rope_from_config(config: dict) -> RopeSpec:
    """The RoPE of a HF config (``rope_parameters``, or the older ``rope_scaling`` + ``rope_theta``),
    with HF's defaults: ``original_max_position_embeddings`` from the config's top level (Phi-3),
    the parameters, or ``max_position_embeddings``; yarn / longrope ``factor`` from their ratio."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE scaling type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ValueError(
            f"partial_rotary_factor {partial} (RoPE over part of each head, as in Phi-4-mini) is not "
            "supported; only 1.0"
        )
    max_position = int(config.get("max_position_embeddings", 2048))
    original = int(
        config.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or max_position
    )
    factor = params.get("factor")
    if factor is None:
        factor = max_position / original if kind in ("yarn", "longrope") else 1.0
    short, long = tuple(params.get("short_factor") or ()), tuple(params.get("long_factor") or ())
    if kind == "longrope" and not (short and long):
        raise ValueError("longrope RoPE scaling needs short_factor and long_factor")
    return RopeSpec(
        theta=theta,
        kind=kind,
        factor=float(factor),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        attention_factor=_optional_float(params.get("attention_factor")),
        mscale=_optional_float(params.get("mscale")),
        mscale_all_dim=_optional_float(params.get("mscale_all_dim")),
        short_factor=tuple(float(x) for x in short),
        long_factor=tuple(float(x) for x in long),
    )


def _layer_windows(config: dict, model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window as transformers applies it: mistral and phi3 on every layer
    when ``sliding_window`` is set; qwen2 / qwen3 only with ``use_sliding_window``, on the
    layers ``layer_types`` names ``sliding_attention`` (default: from ``max_window_layers`` on)."""
    window = config.get("sliding_window")
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and not config.get("use_sliding_window", False):
        window = None
    if model_type == "llama" or not window:
        return (None,) * num_layers
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"sliding_window must be a positive integer, got {window!r}")
    if model_type not in ("qwen2", "qwen3", "gemma2", "gemma3_text"):
        return (window,) * num_layers
    types = config.get("layer_types")
    if types is None and model_type in GEMMA_MODEL_TYPES:
        # every ``sliding_window_pattern``-th layer global (gemma2: every other one; gemma3: 6)
        pattern = int(config.get("sliding_window_pattern", 2 if model_type == "gemma2" else 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if types is None:
        first = int(config.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ValueError(
            "layer_types must name 'sliding_attention' or 'full_attention' for each of the "
            f"{num_layers} layers"
        )
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def _gemma3_text_config(config: dict) -> dict:
    """A gemma3 config as a gemma3_text one: the image-text model's ``text_config`` (the text
    decoder it holds), with transformers' defaults filled in and its two RoPEs as one
    ``rope_parameters`` per layer type."""
    if config.get("model_type") == "gemma3":
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("a gemma3 config.json needs a text_config (the text decoder's fields)")
        # the image-text config keeps the stop tokens at its top level
        config = {"eos_token_id": config.get("eos_token_id"), **text, "model_type": "gemma3_text"}
    if config.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention (an embedding model) is not supported")
    config = {**GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        per_type = {kind: dict(params.get(kind) or {}) for kind in GEMMA3_THETAS}
    else:  # the older fields: rope_scaling of the global layers, rope_local_base_freq
        per_type = {
            "full_attention": {**(params or config.get("rope_scaling") or {})},
            "sliding_attention": {"rope_theta": config.get("rope_local_base_freq")},
        }
        per_type["full_attention"].setdefault("rope_theta", config.get("rope_theta"))
    for kind, theta in GEMMA3_THETAS.items():
        per_type[kind].setdefault("rope_type", "default")
        if per_type[kind].get("rope_theta") is None:
            per_type[kind]["rope_theta"] = theta
    return {**config, "rope_parameters": per_type}


def _positive_int(config: dict, name: str) -> int:
    value = config.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _moe_from_config(config: dict, model_type: str, num_layers: int) -> MoESpec | None:
    """The mixture-of-experts MLP of a qwen3_moe or mixtral config (None for other types), as
    transformers builds it; ValueError names a field it does not serve."""
    if model_type not in ("qwen3_moe", "mixtral"):
        return None
    if model_type == "mixtral":
        experts = _positive_int(config, "num_local_experts")
        top_k = _positive_int(config, "num_experts_per_tok")
        inter, norm_topk, sparse = int(config["intermediate_size"]), True, (True,) * num_layers
    else:
        for name in ("shared_expert_intermediate_size", "num_shared_experts", "n_shared_experts"):
            if config.get(name):
                raise ValueError(f"{name} (shared experts) is not served for qwen3_moe")
        # the Hub's configs name it num_experts; transformers 5 saves num_local_experts
        experts = _positive_int(config, "num_experts" if "num_experts" in config else "num_local_experts")
        top_k = _positive_int(config, "num_experts_per_tok")
        inter = _positive_int(config, "moe_intermediate_size")
        if config.get("use_sliding_window"):
            raise ValueError("use_sliding_window is not served for qwen3_moe")
        norm_topk = bool(config.get("norm_topk_prob", False))
        step = _positive_int({"decoder_sparse_step": 1, **config}, "decoder_sparse_step")
        dense = config.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in dense):
            raise ValueError(f"mlp_only_layers must list layer indices below {num_layers}, got {dense!r}")
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
    if top_k > experts:
        raise ValueError(f"num_experts_per_tok {top_k} exceeds the {experts} experts")
    return MoESpec(experts, top_k, inter, norm_topk, sparse, weights_in_float32=model_type == "mixtral")


def spec_from_config(config: dict) -> ModelSpec:
    """Validate a HF config dict and return its ``ModelSpec``; ValueError names what is wrong."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    local_rope = None
    if model_type in ("gemma3", "gemma3_text"):
        config = _gemma3_text_config(config)
        model_type = "gemma3_text"
        ropes = config["rope_parameters"]
        local_rope = _rope_from_config({**config, "rope_parameters": ropes["sliding_attention"]})
        config = {**config, "rope_parameters": ropes["full_attention"]}
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        # transformers' defaults
        default_head_dim = {"qwen3": 128, "qwen3_moe": 128, "gemma2": 256, "gemma3_text": 256}.get(
            model_type, hidden // heads
        )
        head_dim = int(config.get("head_dim") or default_head_dim)
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        num_layers = int(config["num_hidden_layers"])
        gemma = model_type in GEMMA_MODEL_TYPES
        act = config.get("hidden_activation") or config.get("hidden_act") or "silu"
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        if config.get("mlp_bias"):
            raise ValueError("MLP biases are not supported")
        return ModelSpec(
            model_type=model_type,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", gemma)),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            rope=_rope_from_config(config),
            eos_token_ids=eos_ids,
            local_rope=local_rope,
            layer_windows=_layer_windows(config, model_type, num_layers),
            qk_norm=model_type in QK_NORM_MODEL_TYPES,
            activation=ACTIVATIONS[act],
            gemma=gemma,
            attention_scale=float(config.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma else None,
            # gemma3's attention takes no soft-cap (transformers ignores the field there)
            attn_softcap=_optional_float(config.get("attn_logit_softcapping"))
            if model_type == "gemma2"
            else None,
            final_softcap=_optional_float(config.get("final_logit_softcapping")) if gemma else None,
            moe=_moe_from_config(config, model_type, num_layers),
        )
    except KeyError as missing:
        raise ValueError(f"config.json lacks the field {missing}") from None


def load_spec(folder: Path) -> ModelSpec:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    return spec_from_config(json.loads(path.read_text()))
